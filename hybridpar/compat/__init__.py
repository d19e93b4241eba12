"""Everything that touches a dependency's internals or works around its limits (CPU ranks), one module per dependency."""
