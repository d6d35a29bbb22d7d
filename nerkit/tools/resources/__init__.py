"""The pretrained resources a model reads, built from raw text: lexicons mined or counted (`lexicon`),
static character, bigram and word vectors (`vectors`), and a language model adapted to a domain
(`lm_adapt`)."""
