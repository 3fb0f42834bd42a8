"""The core: the model and the declaration of every field (fieldspec), units, label
vocabularies, configuration, logging and the file-system readers. Imports nothing of
ours: every other layer stands on it."""
