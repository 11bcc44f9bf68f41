"""Where a loaded program's tensors live: the build's memory plan as device arenas, the
artifact's shared weight store, and the peak memory measured while it runs."""
