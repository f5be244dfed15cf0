"""What the Python benchmark scripts share: the JSON row every figure is
printed as, and the choice of benchmarks from the command line."""

from __future__ import annotations

import json
from typing import Callable, Dict, List, Optional


def row(name: str, ours: float, peer: float, peer_name: str, unit: str, digits: int = 3) -> None:
    """One figure: name, ours, peer, peer_name, unit, ratio (peer / ours;
    above 1 means ours is faster)."""
    print(json.dumps({"name": name, "ours": round(ours, digits), "peer": round(peer, digits),
                      "peer_name": peer_name, "unit": unit, "ratio": round(peer / ours, 3)}), flush=True)


def chosen(benches: Dict[str, Callable[[], None]], args: List[str]) -> Optional[List[str]]:
    """The benchmarks `args` names (all when it names none), in table order;
    None after printing the names for --list. An unknown name exits."""
    if "--list" in args:
        print("\n".join(benches))
        return None
    for a in args:
        if a not in benches:
            raise SystemExit(f"unknown benchmark {a!r}; known: {', '.join(benches)}")
    return [name for name in benches if not args or name in args]
