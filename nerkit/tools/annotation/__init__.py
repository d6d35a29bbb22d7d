"""Helping people annotate: which texts to label next (`select`, by the model's uncertainty), and the
entity scores made honest on a dev set (`calibrate`: the CRF's temperature, the span head's threshold
and score map)."""
