"""LIST serving: every way a LIST is answered other than passing it through on its own.

Three answers, one per route kind the router gives a LIST:

- ``resourceVersion=0`` ("any state"), from a synced shared watch (:mod:`.cached`);
- no resourceVersion (a consistent LIST), from a shared watch once it is known to be current,
  in pages when it must be (:mod:`.consistent`, with :mod:`.fresh` and :mod:`.pages`);
- identical LISTs in flight together, from one upstream LIST (:mod:`.batch`).

The boundary: from the hub this package needs only :class:`.ports.SharedWatches` (the running
shared watches by key, and the key a path would share), which ``hub.multiplexer.Hub`` fits as
it is; upstream it sends through the pass-through's headers and ``Upstream``
(:class:`.batch.Outgoing`, which ``server.passthrough.Forwarder`` fits). The server calls each
answer's ``serve`` through the protocols in ``server/api.py``, and knows nothing else of this
package. Answers are values of this package's own (:mod:`.answers`); nothing here imports
aiohttp.
"""
