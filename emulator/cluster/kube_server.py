"""The faithful kmock API (emulator/cluster/kube_api.py) served on 127.0.0.1, in a thread with its own
event loop; the caller's thread talks to it through the real `kubernetes` client and a few
synchronous helpers. `write_kubeconfig(path)` writes a kubeconfig naming it, for a process that
reads one (`tierpilot run` with `actuation.kubeconfig`).

    server = KubeServer().start()
    server.put({"apiVersion": "apps/v1", "kind": "Deployment", ...})
    apps = kubernetes.client.AppsV1Api(server.api_client())
    server.write_kubeconfig(Path("kubeconfig"))
    server.stop()
"""
from __future__ import annotations

import asyncio
import copy
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kmock
import yaml
from kubernetes import client as k8s

from emulator.cluster.kube_api import KIND_RESOURCES, FaithfulEmulator, Fault


class KubeServer:
    """The emulator on 127.0.0.1 in a background thread, with synchronous helpers."""

    def __init__(self, *, schemas: dict[str, Any] | None = None) -> None:
        self._schemas = schemas or {}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopped: asyncio.Future[None] | None = None
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self.emulator: FaithfulEmulator | None = None
        self.url = ""

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stopped = self._loop.create_future()
        async with FaithfulEmulator(schemas=self._schemas) as emu, kmock.Server(emu) as server:
            self.emulator = emu
            for kind, (group, version, plural) in KIND_RESOURCES.items():  # discovery, for kubectl
                emu.resources[kmock.resource(group, version, plural)] = kmock.ResourceInfo(
                    kind=kind, singular=kind.lower(), namespaced=True,
                    verbs={"get", "list", "watch", "create", "update", "patch", "delete"})
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stopped

    def start(self) -> KubeServer:
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("kmock did not start")
        return self

    def stop(self) -> None:
        if self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set_result, None)
        self._thread.join(10)

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    @property
    def emu(self) -> FaithfulEmulator:
        assert self.emulator is not None
        return self.emulator

    # -- client side --
    def api_client(self) -> k8s.ApiClient:
        cfg = k8s.Configuration()
        cfg.host = self.url
        cfg.proxy = None
        return k8s.ApiClient(cfg)

    def write_kubeconfig(self, path: Path, namespace: str | None = None) -> Path:
        """A kubeconfig file whose current context is this server (no credentials: it asks none)."""
        context: dict[str, Any] = {"cluster": "kmock", "user": "tierpilot"}
        if namespace:
            context["namespace"] = namespace
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "kmock",
               "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
               "users": [{"name": "tierpilot", "user": {"token": "kmock"}}],
               "contexts": [{"name": "kmock", "context": context}]}
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    # -- object helpers --
    @staticmethod
    def resource(kind: str) -> Any:
        return kmock.resource(*KIND_RESOURCES[kind])

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object as an outside writer would (ADDED/MODIFIED event)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("generation", 1)
        res = self.resource(obj["kind"])

        async def go() -> dict[str, Any]:
            async with self.emu._lock:
                exists = self.get(obj["kind"], meta.get("namespace"), meta["name"]) is not None
                return await self.emu.store(res, obj, "MODIFIED" if exists else "ADDED")

        return copy.deepcopy(self._call(go()))

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (self.resource(kind), namespace, name)
        objs = self.emu.objects
        if key in objs and not objs[key].deleted:
            return copy.deepcopy(objs[key].raw)
        return None

    def versions(self, kind: str, namespace: str, name: str) -> int:
        return len([v for v in self.emu.objects[(self.resource(kind), namespace, name)].history if v is not None])

    def edit(self, kind: str, namespace: str, name: str, fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Change an object as another controller would (e.g. an operator re-rendering it)."""
        obj = self.get(kind, namespace, name)
        assert obj is not None, (kind, namespace, name)
        fn(obj)
        return self.put(obj)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        key = (self.resource(kind), namespace, name)

        async def go() -> None:
            async with self.emu._lock:
                raw = self.emu.objects[key].raw
                self.emu.objects[key].delete()
                await self.emu._buses[key[0]].put({"type": "DELETED", "object": raw})

        self._call(go())

    def complete_rollout(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        obj = self.get(kind, namespace, name)
        assert obj is not None

        async def go() -> dict[str, Any]:
            async with self.emu._lock:
                return await self.emu.complete(self.resource(kind), obj)

        return self._call(go())

    def manual_rollout(self, kind: str, namespace: str, name: str) -> None:
        self.emu.rollout[(KIND_RESOURCES[kind][2], namespace, name)] = "manual"

    def inject(self, *faults: Fault) -> None:
        self.emu.faults.extend(faults)

    def objects_of(self, kind: str) -> list[dict[str, Any]]:
        res = self.resource(kind)
        return [copy.deepcopy(o.raw) for (r, _, _), o in self.emu.objects.items() if r == res and not o.deleted]

    def requests(self, method: str | None = None, plural: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.emu.log if (method is None or r["method"] == method)
                and (plural is None or r["plural"] == plural)]


__all__ = ["KubeServer"]
