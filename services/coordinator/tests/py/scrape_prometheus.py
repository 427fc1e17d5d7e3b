"""Scrapes URL and parses it with prometheus_client's text parser (the one
Prometheus' Python client ships); prints every sample as JSON:
{"families": {name: type}, "samples": [{"name", "labels", "value"}]}."""
import json
import math
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

with urllib.request.urlopen(sys.argv[1], timeout=30) as resp:
    content_type = resp.headers.get("Content-Type", "")
    text = resp.read().decode("utf-8")
families = {}
samples = []
for family in text_string_to_metric_families(text):
    families[family.name] = family.type
    for s in family.samples:
        value = s.value
        samples.append({
            "name": s.name,
            "labels": dict(s.labels),
            "value": None if math.isnan(value) else value,
        })
print(json.dumps({"content_type": content_type, "families": families, "samples": samples}))
