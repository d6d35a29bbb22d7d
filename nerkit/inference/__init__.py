"""Applying a trained model: the pipeline that `nerkit.load` returns (`pipeline`), the model directory
(`model_dir`), long texts in windows stitched into one valid tag sequence (`windows`), the one
evaluation path (`evaluate`), streaming prediction over files (`stream`) with worker processes
(`workers`), the output formats (`formats`, `html`), and the web service of `nerkit serve`
(`server`, with its micro-batching in `batcher`). Never imports training."""
