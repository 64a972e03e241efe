"""The performance page's results block, one section per benchmark topic.

A result file is named ``<topic>_<device>[_<date>][_<label>].json`` (``qr_H100_2026-11-25``,
``dask_cpu-2core_2026-11-26``, ``ooc_H200_2026-11-26_pm``). Each topic leads with one chart
(that of its latest run that has one) and one table: the latest run per device, the rows of
the devices one under the other. Every file of the topic, the latest ones included, is
linked as JSON (copied next to the charts, under ``docs/assets/bench/``), so the page stays
short while nothing measured is hidden.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["latest_per_device", "parse_name", "render_topics"]

_NAME = re.compile(r"^(?P<topic>[a-z0-9]+(?:_[a-z0-9]+)*?)_(?P<device>[HABL]\d+[A-Za-z0-9-]*|"
                   r"(?:cpu|CPU)[A-Za-z0-9-]*)(?:_(?P<rest>.*))?$")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# labels of runs taken later the same day (or earlier, for a first part), so that the
# latest run of a day is the one the page leads with
_LABEL_ORDER = {"part1": -1, "before_route": -1, "pm": 1, "evening": 2, "late": 3, "night": 4}


def parse_name(name: str, payload: Any = None) -> dict[str, str]:
    """Topic, device, date and label of a result file (date from the environment when the
    name has none)."""
    stem = Path(name).stem
    m = _NAME.match(stem)
    topic, device, rest = (m["topic"], m["device"], m["rest"] or "") if m else (stem, "", "")
    date = _DATE.search(rest)
    when = date.group(0) if date else ""
    if not when and isinstance(payload, dict):
        env = payload.get("environment") if isinstance(payload.get("environment"), dict) else {}
        when = str(env.get("date") or payload.get("date") or "")
    label = _DATE.sub("", rest).strip("_") if date else rest
    return {"topic": topic, "device": device, "date": when, "label": label}


def _order(info: dict[str, str], name: str) -> tuple:
    return (info["date"], _LABEL_ORDER.get(info["label"], 0), name)


def latest_per_device(files: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The latest file of each device among one topic's ``(name, payload)`` pairs, devices
    in name order."""
    best: dict[str, tuple[tuple, str, Any]] = {}
    for name, payload in files:
        info = parse_name(name, payload)
        key = _order(info, name)
        if info["device"] not in best or key > best[info["device"]][0]:
            best[info["device"]] = (key, name, payload)
    return [(n, p) for _, (_, n, p) in sorted(best.items())]


def _rows(payload: Any) -> list[dict[str, Any]]:
    """The file's main rows: ``results``, else ``rows``, else its first list of objects."""
    if not isinstance(payload, dict):
        return []
    keys = [k for k in ("results", "rows") if k in payload]
    keys += [k for k, v in payload.items() if k not in keys and k != "environment"
             and isinstance(v, list)]
    for k in keys:
        val = payload[k]
        if isinstance(val, list) and val and all(isinstance(r, dict) for r in val):
            return val
    return []


def render_topics(files: list[tuple[str, Any]], pngs: list[str], asset_dir: str,
                  *, table, environment_line, accuracy_tables, columns, kind_of) -> str:
    """The block: for each topic its chart, its table and the links to its JSON files.

    ``table``, ``environment_line``, ``accuracy_tables``, ``columns`` and ``kind_of`` are
    the results renderer's formatting (``mpqr.bench.render_results``)."""
    topics: dict[str, list[tuple[str, Any]]] = {}
    for name, payload in files:
        topics.setdefault(parse_name(name, payload)["topic"], []).append((name, payload))
    charts: dict[str, list[str]] = {}
    for png in pngs:  # a chart without its JSON still shows, under its topic
        topic = parse_name(png)["topic"]
        topics.setdefault(topic, [])
        charts.setdefault(topic, []).append(png)
    out = []
    for topic, group in sorted(topics.items()):
        latest = latest_per_device(group)
        out += [f"### {topic}", ""]
        if charts.get(topic):
            payloads = {Path(n).stem: p for n, p in group}
            png = max(charts[topic], key=lambda c: _order(
                parse_name(c, payloads.get(Path(c).stem)), c))
            out += [f"![{Path(png).stem}]({asset_dir}/{png})", ""]
        for name, payload in latest:
            env = payload.get("environment") if isinstance(payload, dict) else None
            out.append(f"- `{name}`: " + environment_line(env or {}))
        if latest:
            out.append("")
        kinds = {kind_of(n, p) if isinstance(p, dict) else "generic" for n, p in latest}
        kind = kinds.pop() if len(kinds) == 1 else "generic"
        if kind == "accuracy":  # the method x precision pivot; the cond(A) sweep is linked
            for name, payload in latest:
                body = accuracy_tables(name, {**payload, "cond_sweep": []}).split("\n", 3)[3]
                out += [f"`{name}`:", "", body.rstrip(), ""]
        else:
            rows = []
            for name, payload in latest:
                device = parse_name(name, payload)["device"]
                rows += [{"device": device, **r} for r in _rows(payload)]
            if rows:
                out += [table(rows, ("device", *columns.get(kind, ()))), ""]
            elif latest:
                out += ["No table in these files; see the JSON.", ""]
        if not group:
            continue
        links = ", ".join(f"[`{n}`]({asset_dir}/{n})" for n, _ in
                          sorted(group, key=lambda f: _order(parse_name(*f), f[0]),
                                 reverse=True))
        out += [f"All runs (JSON, latest first): {links}.", ""]
    return "\n".join(out)
