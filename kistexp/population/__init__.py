"""The simulated relay population, built from a real consensus (docs/population.md, spec population.md).

* ``relays``: ``load_population(path=None, certs=None)`` -> ``Population`` of ``Relay`` (flags, weight, version,
  policy, capacity); the bundled consensus by default
* ``bundled``: the consensus, its key certificates and tor's GeoIP table shipped in ``kistexp/data`` (xz)
* ``bwweights``: the footer's bandwidth-weights and dir-spec §3.8.3's computation
* ``paths``: exit-first path selection with bandwidth weights, subnet exclusions and primary guards
* ``sampling``: tornettools-style scaled networks and client budgets
* ``geoip`` / ``latency``: countries from tor's GeoIP file (the bundled copy by default), RTTs from country
  centroids
* ``classes`` / ``kernels``: OS, kernel tick, tor version, torrc override and hardware profile per relay

Nothing here imports the simulator; ``kistexp.population.kernels`` is small and low-level so the plan
linter can use it.
"""
