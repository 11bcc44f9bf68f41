"""Graph passes only the tvm target runs, before TVM imports the program."""
