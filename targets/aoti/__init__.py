"""AOTInductor targets: ``cpu`` (C++/OpenMP) and ``cuda`` (Triton), one shared base."""
