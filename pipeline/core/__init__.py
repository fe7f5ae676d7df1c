"""The bottom of the pipeline: its records, their schemas and vocabulary, where they are stored, and
the config tree every setting is read through."""
