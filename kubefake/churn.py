"""Background churn: create, modify and delete objects at a steady rate (demo, benchmarks)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from .store import Obj, Store

APPS = ("web", "api", "db", "cache")
PHASES = ("Pending", "Running", "Running", "Succeeded", "Failed")


class Churner:
    """Writes ``rate`` changes per second to ``resource`` around a ``population`` of objects.

    ``step()`` makes one change synchronously; ``start()`` runs steps in a task that this object
    owns, and ``stop()`` cancels and awaits it.
    """

    def __init__(
        self,
        store: Store,
        resource: str = "pods",
        namespace: str = "default",
        rate: float = 10.0,
        population: int = 20,
        seed: int | None = None,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.store = store
        self.resource = resource
        self.namespace = namespace
        self.rate = rate
        self.population = max(1, population)
        self._rng = random.Random(seed)
        self._seq = 0
        self._task: asyncio.Task[None] | None = None
        self.events = 0

    def _names(self) -> list[str]:
        return [
            o["metadata"]["name"]
            for o in self.store.list(self.resource, self.namespace)
            if o["metadata"]["name"].startswith("churn-")
        ]

    def _new_object(self) -> Obj:
        self._seq += 1
        meta: dict[str, Any] = {
            "name": f"churn-{self._seq}",
            "labels": {"app": self._rng.choice(APPS), "churn": "true"},
        }
        if self.resource == "pods":
            image = f"registry.example/{meta['labels']['app']}:1"
            return {
                "metadata": meta,
                "spec": {"containers": [{"name": "main", "image": image}]},
                "status": {"phase": "Pending"},
            }
        return {"metadata": meta, "data": {"seq": str(self._seq)}}

    def _mutate(self, obj: Obj) -> None:
        meta = obj["metadata"]
        meta.setdefault("annotations", {})["churn/seq"] = str(self._seq)
        choice = self._rng.random()
        if self.resource == "pods" and choice < 0.5:
            obj.setdefault("status", {})["phase"] = self._rng.choice(PHASES)
        elif choice < 0.75:
            meta.setdefault("labels", {})["app"] = self._rng.choice(APPS)
        elif self.resource != "pods":
            obj.setdefault("data", {})["seq"] = str(self._seq)

    def step(self) -> str:
        """One change; returns its type (ADDED, MODIFIED or DELETED)."""
        names = self._names()
        roll = self._rng.random()
        low, high = self.population * 0.5, self.population * 1.5
        if len(names) < low or (roll < 0.2 and len(names) < high):
            self.store.create(self.resource, self.namespace, self._new_object())
            kind = "ADDED"
        elif len(names) > high or roll < 0.4:
            self.store.delete(self.resource, self.namespace, self._rng.choice(names))
            kind = "DELETED"
        else:
            self._seq += 1
            self.store.modify(self.resource, self.namespace, self._rng.choice(names), self._mutate)
            kind = "MODIFIED"
        self.events += 1
        return kind

    def fill(self) -> None:
        """Create objects until the population is reached (no waiting)."""
        while len(self._names()) < self.population:
            self.store.create(self.resource, self.namespace, self._new_object())
            self.events += 1

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="churn")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        done = 0
        while True:
            # Schedule against the start time so the rate does not drift with step cost.
            due = start + done / self.rate
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.step()
            done += 1

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise
