"""The application: the command line, the composition root (assembly), the demo and explain."""
