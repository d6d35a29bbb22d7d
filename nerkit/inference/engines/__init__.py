"""nerkit inside the cluster engines people already run (Ray Data, PySpark, Dask): one thin adapter
each (`ray`, `spark`, `dask`), imported only by whoever uses it, over one primitive of nerkit's own
(`tagging`: a model loaded once per process that tags a batch of texts as `nerkit predict` does, and
text files read into rows as `nerkit predict` reads them). The engines schedule, retry and scale;
nerkit never becomes one. Each engine is an optional extra (`pip install nerkit[ray]`, `[spark]`,
`[dask]`); nothing else in nerkit imports them."""
