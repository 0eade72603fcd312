"""The operator API of a fake authority network (JSON over HTTP, bearer token).

Every request needs ``Authorization: Bearer <token>``. Endpoints, under /kistexp/operator:

- ``GET /status``: network, authorities, latest consensus, population summary.
- ``GET /authorities/<nick>``: one authority's status.
- ``GET|PUT /authorities/<nick>/params``: ``{"params": "K=V K2=V2"}`` (or a list of lines, or
  an object) is torrc ``ConsensusParams`` + SIGHUP: used from the authority's next vote. An
  ``Idempotency-Key`` header is kept in the change log; a PUT repeating a logged key, or changing
  nothing, is a no-op.
- ``GET /changes``: the change log (time, authority, old and new lines, idempotency key).
- ``GET|POST|DELETE /authorities/<nick>/faults``: POST ``{"kind": ..., "delay_s": ..,
  "mode": "refuse"|"hang"}`` (kinds in fake_authorities.faults); DELETE clears all,
  ``DELETE /faults/<kind>`` one.
- ``GET /consensus``: consensuses published so far (valid-after, params, signers).
- ``GET|POST /population``: POST ``{"caches": n, "clients": n, "seed": s}`` attaches nodes; GET
  returns their adoption (``?nodes=1`` adds per-node fetch records).

Bounds (docs/security.md): the token is checked on the headers, before any body byte is read; a body is
at most MAX_BODY_BYTES of JSON nested at most MAX_JSON_DEPTH deep, without NaN or infinities; bad input
is a 400 with ``{"error": ...}``, never a 5xx.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs

from fake_authorities.dirport import DirRequest, DirResponse
from fake_authorities.faults import FAULT_KINDS, Fault, FaultError
from kistexp.dirauth.paramsline import ConsensusParams
from kistexp.errors import KistexpError
from kistexp.jsonout import to_json

if TYPE_CHECKING:
    from fake_authorities.authority import FakeAuthority
    from fake_authorities.fetchers import FetcherFleet

PREFIX = "/kistexp/operator"
#: The largest request the API takes: its bodies are a params line, a fault or a population size.
MAX_BODY_BYTES = 64 * 1024
#: The deepest nesting of arrays/objects in a body; the deepest valid body ({"params": {...}}) has 2.
MAX_JSON_DEPTH = 8
#: Seeds for the population's random generator (numpy takes non-negative integers; 64 bits is plenty).
MAX_SEED = 2**64 - 1
MAX_POPULATION_NODES = 100_000


class BadRequest(ValueError):
    """Input the API refuses with 400."""


class OperatedNetwork(Protocol):
    """What the operator API needs from the network it serves (fake_authorities.network's
    FakeAuthorityNetwork is one): its token, its authorities, the change log, the attached
    population and the operations behind the endpoints."""

    @property
    def token(self) -> str: ...

    @property
    def authorities(self) -> Mapping[str, FakeAuthority]: ...

    @property
    def changes(self) -> Sequence[Mapping[str, Any]]: ...

    @property
    def population(self) -> FetcherFleet | None: ...

    def status(self) -> dict[str, Any]: ...

    def authority(self, name: str) -> FakeAuthority: ...

    def set_params(self, name: str, params: str | Sequence[str] | Mapping[str, int],
                   idem_key: str = "") -> tuple[tuple[str, int], ...]: ...

    def inject_fault(self, name: str, fault: Fault) -> None: ...

    def clear_fault(self, name: str, kind: str | None = None) -> None: ...

    def attach_population(self, caches: int = 100, clients: int = 100, seed: int = 1) -> FetcherFleet: ...


def _no_constant(name: str) -> Any:
    raise BadRequest(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadRequest(f"number {text[:20]} is out of range")
    return value


def _depth_ok(obj: Any, limit: int) -> bool:
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return True


def parse_body(raw: bytes) -> Any:
    """The request body as JSON (None when empty), or BadRequest naming what is wrong."""
    if len(raw) > MAX_BODY_BYTES:
        raise BadRequest(f"request body of {len(raw)} bytes exceeds the {MAX_BODY_BYTES}-byte limit")
    if not raw.strip():
        return None
    try:
        body = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise BadRequest(f"request body is nested more than {MAX_JSON_DEPTH} deep") from None
    except BadRequest:
        raise
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("request body is not JSON") from None
    if not _depth_ok(body, MAX_JSON_DEPTH):
        raise BadRequest(f"request body is nested more than {MAX_JSON_DEPTH} deep")
    return body


def _count(spec: dict, name: str, default: int, maximum: int) -> int:
    value = spec.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer, got {json.dumps(value)[:40]}")
    if not 0 <= value <= maximum:
        raise BadRequest(f"{name} must be within 0..{maximum}, got {value}")
    return value


def _json(status: int, obj: Any) -> DirResponse:
    body = (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode()
    return DirResponse(status, body, (("Content-Type", "application/json"),
                                      ("Content-Encoding", "identity"),
                                      ("Content-Length", str(len(body)))))


def _problem(status: int, message: str) -> DirResponse:
    return _json(status, {"error": message})


class OperatorApi:
    def __init__(self, network: OperatedNetwork) -> None:
        self.network = network

    def admit(self, method: str, path: str, headers: dict[str, str]) -> DirResponse | None:
        """Decide on the request line and headers alone (the socket server calls this before reading a body)."""
        if not path.startswith(PREFIX + "/"):
            return _problem(404, f"unknown path {path[:200]}; the operator API lives under {PREFIX}/")
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8", "replace"),
                                                                 self.network.token.encode()):
            return _problem(401, "missing or wrong operator token (Authorization: Bearer <token>)")
        return None

    @staticmethod
    def refuse(status: int, message: str) -> DirResponse:
        return _problem(status, message)

    def handle(self, req: DirRequest) -> DirResponse:
        refused = self.admit(req.method, req.path, req.headers)
        if refused is not None:
            return refused
        parts = [p for p in req.path[len(PREFIX) + 1:].split("/") if p]
        try:
            body = parse_body(req.body)
            return self._route(req.method, parts, body, parse_qs(req.query, max_num_fields=20),
                               req.headers.get("idempotency-key", "").strip()[:200])
        except (KistexpError, FaultError, BadRequest) as exc:
            return _problem(400, str(exc))
        except Exception as exc:  # report, never kill the operator server
            return _problem(500, f"{type(exc).__name__}: {exc}")

    def _route(self, method: str, parts: list[str], body: Any, query: dict[str, list[str]],
               idem_key: str = "") -> DirResponse:
        net = self.network
        if parts == ["status"] and method == "GET":
            return _json(200, net.status())
        if parts == ["consensus"] and method == "GET":
            seen: dict[tuple[str, float], Any] = {}
            for a in net.authorities.values():
                for pub in a.history:
                    seen.setdefault((pub.flavour, pub.valid_after), pub)
            return _json(200, [
                {"flavour": p.flavour, "valid_after": p.valid_after, "params": dict(p.params),
                 "signers": list(p.signers)} for p in sorted(seen.values(), key=lambda p: p.valid_after)])
        if parts == ["changes"] and method == "GET":
            return _json(200, list(net.changes))
        if parts and parts[0] == "population":
            return self._population(method, body, query)
        if len(parts) >= 2 and parts[0] == "authorities":
            try:
                auth = net.authority(parts[1])
            except Exception as exc:
                return _problem(404, str(exc))
            rest = parts[2:]
            if not rest and method == "GET":
                return _json(200, auth.status())
            if rest == ["params"]:
                if method == "GET":
                    return _json(200, {"consensus_params": list(auth.consensus_params),
                                       "vote_params": auth.status()["vote_params"]})
                if method in ("PUT", "POST"):
                    if not isinstance(body, dict) or "params" not in body:
                        return _problem(400, 'expected {"params": "Key=Value ..."}')
                    params = body["params"]
                    if not isinstance(params, (str, list, dict)):
                        return _problem(400, "params must be a string, a list of lines or an object")
                    if isinstance(params, list) and not all(isinstance(line, str) for line in params):
                        return _problem(400, "params as a list must hold strings (ConsensusParams lines)")
                    if isinstance(params, dict) and not all(
                            isinstance(v, int) and not isinstance(v, bool) for v in params.values()):
                        return _problem(400, "params as an object must map keywords to integers")
                    if auth.has("down"):  # no tor process to reload: the change cannot take
                        return _problem(503, f"{auth.nickname} is down: a reload cannot reach it")
                    items = net.set_params(auth.nickname, params, idem_key)
                    return _json(200, {"nickname": auth.nickname, "consensus_params": list(auth.consensus_params),
                                       "vote_params": ConsensusParams(items).format(),
                                       "applies_from": "next vote"})
            if rest and rest[0] == "faults":
                if method == "GET" and len(rest) == 1:
                    return _json(200, to_json(list(auth.faults.values())))
                if method == "POST" and len(rest) == 1:
                    fault = Fault.from_json(body)
                    net.inject_fault(auth.nickname, fault)
                    return _json(200, to_json(list(auth.faults.values())))
                if method == "DELETE":
                    kind = rest[1] if len(rest) == 2 else None
                    if kind is not None and kind not in FAULT_KINDS:
                        return _problem(400, f"unknown fault {kind!r}")
                    net.clear_fault(auth.nickname, kind)
                    return _json(200, to_json(list(auth.faults.values())))
        return _problem(404 if method == "GET" else 405, f"no operator endpoint {method} {PREFIX}/{'/'.join(parts)}")

    def _population(self, method: str, body: Any, query: dict[str, list[str]]) -> DirResponse:
        net = self.network
        if method == "POST":
            if body is not None and not isinstance(body, dict):
                return _problem(400, 'expected {"caches": n, "clients": n, "seed": s}')
            spec = body or {}
            unknown = set(spec) - {"caches", "clients", "seed"}
            if unknown:
                return _problem(400, f"unknown population field(s): {', '.join(sorted(unknown))}")
            caches = _count(spec, "caches", 100, MAX_POPULATION_NODES)
            clients = _count(spec, "clients", 100, MAX_POPULATION_NODES)
            seed = _count(spec, "seed", 1, MAX_SEED)
            if caches + clients == 0:
                return _problem(400, "caches and clients must not both be 0")
            if clients and not caches:
                return _problem(400, "clients fetch from caches: attach at least one cache")
            net.attach_population(caches=caches, clients=clients, seed=seed)
            return _json(200, net.population.summary())
        if method == "GET":
            if net.population is None:
                return _problem(404, "no population attached (POST /kistexp/operator/population)")
            out = net.population.summary()
            if query.get("nodes", ["0"])[0] not in ("0", ""):
                out["nodes"] = net.population.records()
            return _json(200, out)
        return _problem(405, f"{method} not allowed on {PREFIX}/population")
