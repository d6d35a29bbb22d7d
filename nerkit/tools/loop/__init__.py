"""Label Studio's training loop, closed (`nerkit serve --label-studio --models DIR`): training
requests from Label Studio coalesced into one background job at a time (`queue`), the job itself,
a process of its own that reads the project's annotations through Label Studio's API, trains from
the served model and scores the result on held-out tasks (`job`), the model versions on disk and
which one is served (`versions`), and the backend that ties them to the server (`backend`); and a
Label Studio of one's own on 127.0.0.1 with the API calls that drive a project (`studio`: `nerkit
bench label-studio` and the tests). docs/label-studio-loop.md says how to run it."""
