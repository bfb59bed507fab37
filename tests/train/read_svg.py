#!/usr/bin/python3
"""Parses an SVG loss plot with Python's own XML parser and prints, as one
JSON object, what a test checks: the root element, the plot group's data-*
attributes, each polyline's series and points, the number of circles and
every text.

Exits 1 (ParseError) when the file is not well-formed XML.

Usage: read_svg.py SVG_FILE
"""

import json
import sys
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"


def main(path):
    root = ET.parse(path).getroot()
    plot = root.find(f".//{SVG}g[@id='plot']")
    polylines = []
    for polyline in root.iter(f"{SVG}polyline"):
        points = [[float(c) for c in pair.split(",")] for pair in polyline.get("points").split()]
        polylines.append({"series": polyline.get("data-series"), "points": points})
    print(json.dumps({
        "root": root.tag,
        "width": root.get("width"),
        "height": root.get("height"),
        "plot": dict(plot.attrib) if plot is not None else None,
        "polylines": polylines,
        "circles": sum(1 for _ in root.iter(f"{SVG}circle")),
        "texts": ["".join(t.itertext()) for t in root.iter(f"{SVG}text")],
        "scripts": sum(1 for _ in root.iter(f"{SVG}script")),
    }))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
