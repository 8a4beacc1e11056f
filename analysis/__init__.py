"""Tools that read finished runs: sweep tables and plots, attention maps."""
