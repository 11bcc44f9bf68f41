"""The artifact format: the zip and its safe reader, the manifest's types, dtype names,
signatures, weight files, and the checks a manifest must pass before anything loads."""
