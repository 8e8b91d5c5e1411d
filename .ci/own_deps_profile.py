#!/usr/bin/env python3
"""Print a cargo `--config` file that builds one step's own dependencies at opt-level 1.

Usage: own_deps_profile.py BASE.json STEP.json > profile.toml

Both inputs are cargo's unit graphs (`cargo ... --no-run -Z unstable-options --unit-graph`):
BASE of a build that ran before (the README's test command), STEP of the build that follows.
A unit of STEP whose identity (package, target, profile, features, mode and, recursively,
its dependencies) is also in BASE is reused from BASE's build; every other unit is built for
STEP alone. The output lists each registry package all of whose STEP units are built for STEP
alone, and which compiles code for the target, with `opt-level = 1`: cheaper to compile, and
rebuilding nothing that BASE built. Packages with one version in STEP are named alone, others
as `name@version`.

CI's kernel tests on lavapipe use it (see .ci/run): their `wgpu`/`fusion` features change
features from `libc` and `serde` up, so most of Burn's stack is compiled a second time for a
step whose run time is the software Vulkan driver compiling shaders.
"""

import hashlib
import json
import sys
from collections import defaultdict


def identities(path):
    """The units of a unit graph, each with a hash of its identity."""
    with open(path, encoding="utf-8") as f:
        units = json.load(f)["units"]
    memo = {}

    def ident(i):
        if i not in memo:
            u = units[i]
            deps = sorted(ident(d["index"]) for d in u["dependencies"])
            key = [u["pkg_id"], u["target"]["name"], u["target"]["kind"], u["profile"],
                   sorted(u["features"]), u["mode"], u.get("platform"), deps]
            memo[i] = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()
        return memo[i]

    return [(u, ident(i)) for i, u in enumerate(units)]


def name_version(unit):
    """`name@version` of a unit's package."""
    return unit["pkg_id"].split("#")[-1]


def own_packages(base, step):
    """Registry packages (`name@version`) whose units in `step` are all absent from `base`
    and that build target code (not only build scripts and proc macros)."""
    reused = {h for _, h in base}
    units = defaultdict(list)
    for u, h in step:
        if u["pkg_id"].startswith("registry+"):
            units[name_version(u)].append((u, h not in reused))
    return sorted(
        nv for nv, us in units.items()
        if all(own for _, own in us)
        and any(u["mode"] == "build" and u["profile"]["opt_level"] != "0" for u, _ in us)
    )


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: own_deps_profile.py BASE.json STEP.json")
    base, step = identities(sys.argv[1]), identities(sys.argv[2])
    packages = own_packages(base, step)
    versions = defaultdict(set)
    for u, _ in step:
        nv = name_version(u)
        versions[nv.rsplit("@", 1)[0]].add(nv)
    print(f"# {len(packages)} packages built for this step alone (.ci/own_deps_profile.py)")
    for nv in packages:
        name = nv.rsplit("@", 1)[0]
        spec = name if len(versions[name]) == 1 else nv
        print(f'[profile.release.package."{spec}"]\nopt-level = 1')


if __name__ == "__main__":
    main()
