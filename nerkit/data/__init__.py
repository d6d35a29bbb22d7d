"""Corpora and their rules, below everything that models: reading and writing CoNLL and JSON-lines
files (`corpus`), annotation tools' files (`annotation`: doccano, Label Studio), what every reader
shares (`records`), every tag-scheme rule (`tags`), the text rules shared by features and models
(`text`), the word2vec vector format read by vectors and lexicons alike (`word2vec`), corpus
statistics (`stats`) and the train/dev/test splits of a config (`splits`).
Imports only the base modules."""
