"""Print the project's own requirements (base dependencies plus extras) from pyproject.toml.

The image builds and images/wheelhouse.sh use it so that the dependency layer depends on pyproject.toml
only, not on the source tree. Standard library only (tomllib, Python >= 3.11).
Usage: python3 images/project-requirements.py [PYPROJECT] [--extras cpu,operator]
       python3 images/project-requirements.py [PYPROJECT] --no-deps   # [tool.longhaul] no-deps: for pip --no-deps
"""

import argparse
import sys
import tomllib


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject", nargs="?", default="pyproject.toml")
    parser.add_argument("--extras", default="", help="comma- or space-separated extra names")
    parser.add_argument(
        "--no-deps",
        action="store_true",
        help="print [tool.longhaul] no-deps instead: packages installed with `pip install --no-deps`",
    )
    args = parser.parse_args(argv)
    with open(args.pyproject, "rb") as fh:
        doc = tomllib.load(fh)
    if args.no_deps:
        print("\n".join(doc.get("tool", {}).get("longhaul", {}).get("no-deps", [])))
        return 0
    project = doc["project"]
    lines = list(project.get("dependencies", []))
    extras = project.get("optional-dependencies", {})
    for name in args.extras.replace(",", " ").split():
        if name not in extras:
            valid = ", ".join(sorted(extras))
            print(f"{args.pyproject}: unknown extra {name!r}; valid: {valid}", file=sys.stderr)
            return 2
        lines.extend(extras[name])
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
