"""Finding label errors (`nerkit data audit`): K models trained on K-1 folds of a training corpus each
judge the fold they never saw (folds.py), from their exact span probabilities (evidence.py); what they
dispute is a suspect of a kind, scored, and each sentence gets a suspicion score (suspects.py); the
corpus ranked worst first is written for review (report.py); run.py ties them together. noise.py
plants known errors in a corpus and ranking.py measures a ranking against them (`nerkit bench audit`)."""
