"""Graph passes only the AOTInductor targets run."""
