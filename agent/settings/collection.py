"""What the agent collects and how it serves it: the `scrape:`, `store:`, `server:`, `targets:`,
`prometheus:`, `shard:`, `tiers:`, `kv_events:` and `export:` sections."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from agent.kvevents.settings import KvEventsSettings
from agent.settings.frozen import _Frozen
from contracts.redact import redact_url
from contracts.tier_model import Role


class ScrapeSettings(_Frozen):
    interval_s: float = Field(15.0, gt=0, le=3600.0, description="seconds between scrape cycles")
    timeout_s: float = Field(5.0, gt=0, le=300.0, description="total time allowed per target (connect + body)")
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0, le=256 * 1024 * 1024,
                                description="decompressed body cap per target (body_size_limit)")
    sample_limit: int = Field(50_000, gt=0, le=1_000_000,
                              description="sample lines per scrape; more marks the target down (sample_limit)")
    label_limit: int = Field(64, gt=0, le=1024, description="labels per series; more: target down (label_limit)")
    label_name_length_limit: int = Field(256, gt=0, le=65536,
                                         description="characters per label name; longer: down (label_length)")
    label_value_length_limit: int = Field(4096, gt=0, le=1024 * 1024,
                                          description="characters per label value; longer: down (label_length)")
    max_models_per_target: int = Field(
        16, ge=0, le=100_000, description="distinct model labels kept per target (0: no bound); the most "
        "active are kept, the others dropped and counted (model_budget)")
    max_series_per_target: int = Field(
        1000, ge=0, le=1_000_000, description="normalised series kept per target (0: no bound); whole signals "
        "of the least active models dropped beyond it (series_budget)")
    concurrency: int = Field(256, gt=0, le=4096, description="simultaneous connections")
    backoff_base_s: float = Field(5.0, ge=0, le=86_400.0, description="first back-off after a failure; doubles each time")
    backoff_max_s: float = Field(300.0, ge=0, le=86_400.0, description="back-off ceiling")
    blind_after_cycles: int = Field(3, ge=1, le=10_000, description="cycles in a row with no target up before "
                                    "/healthz reports the agent degraded (blind)")


class StoreSettings(_Frozen):
    retention_s: float = Field(900.0, gt=0, le=86_400.0, description="how long normalised samples are kept")
    window_s: float = Field(300.0, gt=0, le=86_400.0, description="window for ratios, rates and quantiles")


class ServerSettings(_Frozen):
    host: str = Field("0.0.0.0", description="address /metrics listens on")
    port: int = Field(9400, ge=0, le=65535, description="port of /metrics (0 picks a free one)")
    snapshot: bool = Field(False, description="serve /snapshot (all data as JSON) to loopback clients only")


class StaticTarget(_Frozen):
    url: str
    role: Literal[Role, "auto"] = Field("auto", description="omitted or auto: detected from the payload")
    pod: str
    namespace: str = ""
    node: str = ""

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {redact_url(v)!r}")
        return v


DEFAULT_PORTS: dict[str, tuple[int, str]] = {
    "vllm": (8000, "/metrics"),
    "lmcache": (9090, "/metrics"),
    "curvine-master": (9001, "/metrics"),
    "curvine-worker": (9002, "/metrics"),
    "curvine-fuse": (9003, "/metrics"),
    "router": (8001, "/metrics"),
}


class RoleDiscovery(_Frozen):
    selector: str = Field(description="Kubernetes label selector, e.g. app=vllm")
    port: int | None = Field(None, ge=1, le=65535, description="default port when the pod has no annotation")
    path: str | None = None
    scheme: Literal["http", "https"] = "http"


class KubernetesSettings(_Frozen):
    enabled: bool = False
    namespace: str | None = Field(None, description="namespace to watch; unset = all namespaces")
    roles: dict[Role, RoleDiscovery] = Field(default_factory=dict)
    in_cluster: bool | None = Field(None, description="None: in-cluster config if available, else kubeconfig")
    watch_timeout_s: int = Field(300, gt=0, le=3600)


class TargetSettings(_Frozen):
    static: tuple[StaticTarget, ...] = ()
    file: Path | None = Field(None, description="YAML file with a `targets:` list, re-read when it changes")
    kubernetes: KubernetesSettings = KubernetesSettings()


class BasicAuth(_Frozen):
    username: str
    password_file: Path = Field(description="file holding the password (re-read each cycle)")


class TlsSettings(_Frozen):
    ca_file: Path | None = Field(None, description="CA bundle that signed the server certificate")
    cert_file: Path | None = Field(None, description="client certificate (mutual TLS)")
    key_file: Path | None = Field(None, description="client key (mutual TLS)")
    insecure_skip_verify: bool = Field(False, description="do not verify the server certificate")

    @model_validator(mode="after")
    def _pair(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self


class PrometheusSourceSettings(_Frozen):
    """`prometheus:` read the fleet's series from a Prometheus-compatible query API
    (agent/collect/prom/source.py) instead of scraping every pod (`source: prometheus`)."""

    url: str | None = Field(None, description="base URL of the query API, e.g. http://prometheus:9090 "
                                              "(Thanos, Mimir: the prefix before /api/v1)")
    bearer_token_file: Path | None = Field(None, description="file holding a bearer token (re-read each cycle)")
    basic_auth: BasicAuth | None = None
    tls: TlsSettings = TlsSettings()
    timeout_s: float = Field(10.0, gt=0, description="total time allowed per query")
    concurrency: int = Field(16, gt=0, description="queries in flight at once")
    roles: dict[Role, str] = Field(
        default_factory=dict,
        description='per role, a series selector without braces, e.g. vllm: \'job="vllm"\'; '
                    "empty: every series, role from the `job` label or the metric name")
    pod_label: str = Field("pod", description="label naming the pod (else `instance` is used)")
    namespace_label: str = Field("namespace", description="label naming the namespace")
    backfill: bool = Field(True, description="at start, fill the window with one range query per series")
    aggregate: Literal["server", "agent"] = Field(
        "server", description="server: Prometheus aggregates every mapping rule per pod and model "
                              "(prom/plan.py; small answers, the large-fleet mode); agent: read the raw "
                              "series and normalise them here, as a direct scrape does")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        """The prefix before /api/v1: `http://host:9090/`, `.../api/v1` and `.../api/v1/` all name
        the same API."""
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {redact_url(v)!r}")
        if not v:
            return v
        v = v.rstrip("/")
        return v.removesuffix("/api/v1") if v.endswith("/api/v1") else v

    @model_validator(mode="after")
    def _one_auth(self) -> PrometheusSourceSettings:
        if self.bearer_token_file is not None and self.basic_auth is not None:
            raise ValueError("give bearer_token_file or basic_auth, not both")
        return self


class ShardSettings(_Frozen):
    """`shard:` this replica scrapes (and follows the KV events of) only the targets whose
    rendezvous hash falls in its shard (agent/collect/shard.py)."""

    count: int = Field(1, ge=1, description="replicas sharing the direct scrape")
    index: int | None = Field(None, ge=0, description="this replica's shard; unset: the ordinal at the end "
                                                      "of $POD_NAME (StatefulSet), else 0")
    peers: tuple[str, ...] = Field((), description="base URLs of the other replicas' /window and /kv/sketch "
                                                  "(e.g. http://tierpilot-1.tierpilot:9400): the leader's fleet view")
    peer_timeout_s: float = Field(5.0, gt=0, description="time allowed per peer read")
    token_file: Path | None = Field(None, description="file holding the bearer token the replicas share (a "
                                    "mounted Secret): required on /window and /kv/sketch, sent to the peers; "
                                    "re-read when the file changes")
    token_grace_s: float = Field(300.0, ge=0, description="after a rotation, how long the previous token is "
                                 "still accepted (replicas see the new Secret at different times)")
    allow_unauthenticated: bool = Field(False, description="with count > 1 and no token_file, serve /window and "
                                        "/kv/sketch to anyone who reaches the port (e.g. behind a NetworkPolicy)")

    @model_validator(mode="after")
    def _in_range(self) -> ShardSettings:
        if self.index is not None and self.index >= self.count:
            raise ValueError(f"index {self.index} must be below count {self.count}")
        return self

    @model_validator(mode="after")
    def _peer_endpoints_guarded(self) -> ShardSettings:
        if self.count > 1 and self.token_file is None and not self.allow_unauthenticated:
            raise ValueError("count > 1 serves every pod's window to the peers on /window and /kv/sketch: "
                             "set token_file (a Secret mounted in every replica), or "
                             "allow_unauthenticated: true if the network already keeps others out")
        return self


class TierSettings(_Frozen):
    kv_bytes_per_token: float | None = Field(
        131072.0, gt=0, le=64 * 2**20, description="2 x layers x KV heads x head dim x dtype bytes (Llama-3.1-8B bf16)")
    cpu_capacity_gib: float | None = Field(None, gt=0, le=65536.0, description="LMCache CPU buffer, for in-process usage")
    lmcache: Literal["auto", "in-process", "mp", "none"] = Field(
        "auto", description="how LMCache runs, for the lmcache_series_missing check: auto = a vLLM pod whose KV "
                            "connector sees traffic, with no LMCache series and no vLLM native offload")


# -- KV events (agent/kvevents; wired in agent/runtime/assembly/kv_events.py) ----------------------
class KvEventsSection(KvEventsSettings):
    """`kv_events:` the KV-event subscriber (agent/kvevents). Endpoints come from `endpoints` and,
    with `discovery`, from `tierpilot.io/kv-events-*` annotations on the discovered vLLM pods."""

    enabled: bool = Field(False, description="subscribe to the vLLM pods' KV-event streams")
    discovery: bool = Field(True, description="read endpoints from pod annotations (needs targets.kubernetes)")
    discovery_interval_s: float = Field(30.0, gt=0, le=3600.0, description="how often discovered pods are re-read")
    default_model: str | None = Field(None, description="model of a pod without tierpilot.io/model")

    def manager_settings(self) -> KvEventsSettings:
        """The subscriber's own settings (without the agent-side keys)."""
        return KvEventsSettings(**self.model_dump(exclude={"enabled", "discovery", "discovery_interval_s",
                                                           "default_model"}))


class ExportSettings(_Frozen):
    """`export:` who serves the fleet series when several replicas scrape the same targets."""

    fleet: Literal["all", "leader"] = Field(
        "all", description="all: this replica serves every series; leader: only the Lease holder serves the "
                           "fleet series (tier, TTFT, per-target health, KV events), every replica its own "
                           "agent series, so replicas scraping the same targets are not counted twice")
