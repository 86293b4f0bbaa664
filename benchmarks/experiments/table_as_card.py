"""Copy a config table (default: the shipped H200 one) into DIR under this GPU's name, so that
``SGLANG_FP4EXT_CONFIG_DIR=DIR`` makes it this card's table (tables are read by device name): an
H200 table as the baseline on another Hopper card. ``--unless-h200``: do nothing on an H200.

    python benchmarks/experiments/table_as_card.py DIR [--src TABLE.json] [--unless-h200]
"""

import argparse
import json
import os

import torch

from sglang_fp4ext.moe.tables import table_file_name, table_path

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--src", default=str(table_path("NVIDIA H200")))
ap.add_argument("--unless-h200", action="store_true")
a = ap.parse_args()
name = torch.cuda.get_device_name()
if not (a.unless_h200 and name == "NVIDIA H200"):
    t = json.load(open(a.src))
    t["device_name"] = name
    os.makedirs(a.dir, exist_ok=True)
    json.dump(t, open(os.path.join(a.dir, table_file_name(name)), "w"))
    print(a.src, "as the table of", name, "in", a.dir)
