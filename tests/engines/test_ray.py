"""nerkit on Ray Data (nerkit/inference/engines/ray.py) against a real local Ray cluster started here
(`ray.init(num_cpus=2)`: a head with its GCS and raylet, and worker processes for the actors): the
entities of several thousand lines are `nerkit predict`'s, in order, with scores; an actor killed in
the middle of the run is restarted by Ray Data and its batch retried, no line lost or repeated; a line
predict refuses is a row with predict's message, a missing text a row with its error."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from engine_helpers import assert_tagged_as_predict, crash_setting, deadline, one_crash  # noqa: E402

from nerkit.inference.engines.ray import EntityTagger, read_lines  # noqa: E402
from nerkit.inference.engines.tagging import CRASH_VARIABLE  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


@pytest.fixture(scope="module")
def cluster(crash_marker):
    """A local Ray cluster of 2 CPUs whose workers crash once when the test arms it (the marker)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {CRASH_VARIABLE: crash_setting(crash_marker)}})
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # rows come back in input order
    context.enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()


def tagged(source, model, actors: int = 2, **options) -> list[dict]:
    """`source` (paths, or a dataset) tagged by a pool of `actors` (one for an input of one block:
    Ray warns of a second that would have nothing to do)."""
    dataset = read_lines(str(source)) if not isinstance(source, ray.data.Dataset) else source
    with deadline(240):
        return dataset.map_batches(EntityTagger, fn_constructor_kwargs={"model": str(model), **options},
                                   compute=ray.data.ActorPoolStrategy(size=actors), batch_size=200,
                                   batch_format="pyarrow").take_all()


def test_the_entities_are_predicts_in_order_with_scores(cluster, corpus, tiny_model_dir):
    directory, _, entities = corpus
    rows = tagged(directory, tiny_model_dir, scores=True)
    assert_tagged_as_predict(rows, entities)
    assert [(r["path"], r["line"]) for r in rows] == sorted((r["path"], r["line"]) for r in rows)


def test_an_actor_killed_mid_run_is_restarted_and_no_line_is_lost(cluster, corpus, tiny_model_dir, crash_marker):
    directory, _, entities = corpus
    with one_crash(crash_marker, "actor"):  # the first actor to reach its third batch exits at once
        rows = tagged(directory, tiny_model_dir, scores=True)
    assert_tagged_as_predict(rows, entities)


def test_a_line_predict_refuses_is_a_row_with_its_message(cluster, refused, tiny_model_dir):
    for path, (field, line, message) in refused.items():
        rows = tagged(read_lines(path, field=field), tiny_model_dir, actors=1)
        bad = [r for r in rows if r["error"] is not None]
        assert [(r["line"], r["error"], r["entities"]) for r in bad] == [(line, message, None)]
        assert all(r["entities"] is not None for r in rows if r["error"] is None)


def test_a_row_without_text_gets_an_error_and_the_others_their_entities(cluster, tiny_model_dir):
    rows = tagged(ray.data.from_items([{"text": "张伟在北京工作。"}, {"text": None}, {"text": ""}]), tiny_model_dir, actors=1)
    assert [r["error"] for r in rows] == [None, "no text to tag: the row holds no value", None]
    assert rows[1]["entities"] is None and rows[2]["entities"] == []
