"""Text becomes model input here, in one place: the featuriser (`featurizer`: character, bigram and
lexicon-word ids), the lexicon and the FLAT lattice (`lexicon`), and padded, length-bucketed batches
(`batch`). Imports data and the base only; a language model's vocabulary arrives as any object with
`ids(chars)`."""
