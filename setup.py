from setuptools import find_packages, setup

# The repository keeps the planner (topology/) and the benchmarks (benchmarks/) as top-level folders;
# installed, they are hybridpar.topology and hybridpar.benchmarks, so hybridpar claims no generic
# top-level package name in site-packages.
SUBPACKAGES = {"topology": "hybridpar.topology", "benchmarks": "hybridpar.benchmarks"}
packages = find_packages(include=["hybridpar", "hybridpar.*"])
for folder, name in SUBPACKAGES.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(where=folder)]

setup(
    name="hybridpar",
    version="0.1.0",
    description="Hybrid 3D-parallel LLM training: DP outermost, TP x PP (x CP) per replica, ZeRO on DP",
    packages=packages,
    package_dir={name: folder for folder, name in SUBPACKAGES.items()},
    package_data={"hybridpar": ["data/corpus/*.txt"], "hybridpar.topology": ["data/*.json"]},
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
    entry_points={
        "console_scripts": ["hybridpar=hybridpar.cli:main"],
        # Subcommands that packages built on hybridpar add (hybridpar/cli/main.py).
        "hybridpar.commands": ["bench=hybridpar.benchmarks.cli"],
    },
)
