"""`dra-controller migrate`: device-plugin-era manifests rewritten to ResourceClaims.

* `gfd` — the one table of GPU Feature Discovery node label to device attribute (CEL).
* `workloads` — where the pod spec sits in each workload kind.
* `convert` — one object in, the claim-based object plus ResourceClaimTemplates out.
* `documents` — reading files, directories and stdin document by document.
* `command` — the subcommand: options, report, output, diff.
"""
