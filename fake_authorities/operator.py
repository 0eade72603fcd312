"""The operator API of a fake authority network (JSON over HTTP, bearer token).

Every request needs ``Authorization: Bearer <token>``. Endpoints, under /kistexp/operator:

- ``GET /status``: network, authorities, latest consensus, population summary.
- ``GET /authorities/<nick>``: one authority's status.
- ``GET|PUT /authorities/<nick>/params``: ``{"params": "K=V K2=V2"}`` (or a list of lines, or
  an object) is torrc ``ConsensusParams`` + SIGHUP: used from the authority's next vote.
- ``GET|POST|DELETE /authorities/<nick>/faults``: POST ``{"kind": ..., "delay_s": ..,
  "mode": "refuse"|"hang"}`` (kinds in fake_authorities.faults); DELETE clears all,
  ``DELETE /faults/<kind>`` one.
- ``GET /consensus``: consensuses published so far (valid-after, params, signers).
- ``GET|POST /population``: POST ``{"caches": n, "clients": n, "seed": s}`` attaches nodes; GET
  returns their adoption (``?nodes=1`` adds per-node fetch records).
"""

from __future__ import annotations

import hmac
import json
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from fake_authorities.dirport import DirRequest, DirResponse
from fake_authorities.faults import FAULT_KINDS, Fault, FaultError
from kistexp.errors import KistexpError

if TYPE_CHECKING:
    from fake_authorities.network import FakeAuthorityNetwork

PREFIX = "/kistexp/operator"


def _json(status: int, obj: Any) -> DirResponse:
    body = (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode()
    return DirResponse(status, body, (("Content-Type", "application/json"),
                                      ("Content-Encoding", "identity"),
                                      ("Content-Length", str(len(body)))))


def _problem(status: int, message: str) -> DirResponse:
    return _json(status, {"error": message})


class OperatorApi:
    def __init__(self, network: FakeAuthorityNetwork) -> None:
        self.network = network

    def handle(self, req: DirRequest) -> DirResponse:
        path, query = req.path, req.query
        if not path.startswith(PREFIX + "/"):
            return _problem(404, f"unknown path {path}; the operator API lives under {PREFIX}/")
        auth = req.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                 self.network.token.encode()):
            return _problem(401, "missing or wrong operator token (Authorization: Bearer <token>)")
        parts = [p for p in path[len(PREFIX) + 1:].split("/") if p]
        try:
            body = json.loads(req.body) if req.body.strip() else None
        except (ValueError, UnicodeDecodeError):
            return _problem(400, "request body is not JSON")
        try:
            return self._route(req.method, parts, body, parse_qs(query))
        except (KistexpError, FaultError) as exc:
            return _problem(400, str(exc))
        except Exception as exc:  # report, never kill the operator server
            return _problem(500, f"{type(exc).__name__}: {exc}")

    def _route(self, method: str, parts: list[str], body: Any, query: dict[str, list[str]]) -> DirResponse:
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
                    items = net.set_params(auth.nickname, params)
                    return _json(200, {"nickname": auth.nickname, "consensus_params": list(auth.consensus_params),
                                       "vote_params": " ".join(f"{k}={v}" for k, v in items),
                                       "applies_from": "next vote"})
            if rest and rest[0] == "faults":
                if method == "GET" and len(rest) == 1:
                    return _json(200, [f.to_json() for f in auth.faults.values()])
                if method == "POST" and len(rest) == 1:
                    fault = Fault.from_json(body)
                    net.inject_fault(auth.nickname, fault)
                    return _json(200, [f.to_json() for f in auth.faults.values()])
                if method == "DELETE":
                    kind = rest[1] if len(rest) == 2 else None
                    if kind is not None and kind not in FAULT_KINDS:
                        return _problem(400, f"unknown fault {kind!r}")
                    net.clear_fault(auth.nickname, kind)
                    return _json(200, [f.to_json() for f in auth.faults.values()])
        return _problem(404 if method == "GET" else 405, f"no operator endpoint {method} {PREFIX}/{'/'.join(parts)}")

    def _population(self, method: str, body: Any, query: dict[str, list[str]]) -> DirResponse:
        net = self.network
        if method == "POST":
            spec = body if isinstance(body, dict) else {}
            unknown = set(spec) - {"caches", "clients", "seed"}
            if unknown:
                return _problem(400, f"unknown population field(s): {', '.join(sorted(unknown))}")
            try:
                caches, clients, seed = (int(spec.get("caches", 100)), int(spec.get("clients", 100)),
                                         int(spec.get("seed", 1)))
            except (TypeError, ValueError):
                return _problem(400, "caches, clients and seed must be integers")
            if not (0 <= caches <= 100_000 and 0 <= clients <= 100_000 and caches + clients > 0):
                return _problem(400, "caches and clients must be within 0..100000, not both 0")
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
