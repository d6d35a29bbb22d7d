"""Pretrained inputs: static vectors (`vectors`), language models read from local directories (`base`
the shared character-features module, `vocab` their character vocabularies, torch-free, `bert`
Hugging Face encoders, `lac` Baidu's LAC-small, `paddle` the Paddle file readers, `hub_cache` a hub
name found in the local Hugging Face cache), the disk cache of
frozen features (`cache`) and the one table of LM kinds that loads and saves them (`loading`).
Imports data and the base only."""
