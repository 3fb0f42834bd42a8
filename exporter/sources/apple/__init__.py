"""Apple Silicon: the long-lived `macmon pipe` child and its JSON parser.
"""
