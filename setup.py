from setuptools import find_packages, setup

setup(
    name="hybridpar",
    version="0.1.0",
    description="Hybrid 3D-parallel LLM training: DP outermost, TP x PP (x CP) per replica, ZeRO on DP",
    packages=find_packages(include=["hybridpar", "hybridpar.*", "topology", "topology.*", "benchmarks"]),
    package_data={"hybridpar": ["data/corpus/*.txt"]},
    python_requires=">=3.10",
    install_requires=[
        # Ranges here; exact, tested pins live in requirements.txt.
        "torch>=2.13.0",
        "deepspeed>=0.19.8",
        "megatron-core>=0.16.1",
        "einops>=0.8",
        "PyYAML>=6.0",
        "tqdm>=4.60",
        "matplotlib>=3.8",
        "tokenizers>=0.20",
        "safetensors>=0.4.3",
        "transformers>=5.0",  # the tests use its 5.x API (rope_parameters); hybridpar itself never imports it
    ],
    entry_points={"console_scripts": ["hybridpar=hybridpar.cli:main"]},
)
