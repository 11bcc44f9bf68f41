"""Passes that fuse ops into fewer, larger ones: batch norm into its conv, parallel
linears into one, explicit attention into SDPA."""
