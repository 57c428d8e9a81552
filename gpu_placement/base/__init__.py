"""The vocabulary every layer speaks: the configuration file, label and annotation keys, quantities,
CUDA and driver versions, timestamps, label selectors, and quoting what users wrote."""
