"""Build settings as files: the --config / --save-config TOML format (``config_file``) and
the names its keys share with the build's flags (``keys``). The CLI and ``exporter matrix``
both read and write it; it imports neither."""
