"""The chart's claim-config admission policy is the one generated from the GpuConfig schema.

Its behaviour is tested on a real API server (tests/integration/test_admission_policy.py);
here: the committed template is what the generator prints, and it names the chart's settings.
"""

from __future__ import annotations

from draplugin.prepare.admission import chart_template, policy_objects
from tests.kube.chart import CHART

TEMPLATE = CHART / "templates" / "claimconfig-policy.yaml"


def test_the_chart_template_is_the_generated_one() -> None:
    assert TEMPLATE.read_text() == chart_template(), (
        f"regenerate: python -m draplugin.prepare.admission > {TEMPLATE}"
    )


def test_the_template_follows_the_driver_name_and_can_be_turned_off() -> None:
    text = chart_template()
    assert text.startswith("{{- if .Values.claimConfigPolicy.enabled }}") and text.endswith("{{- end }}\n")
    assert '"{{ .Values.driverName }}"' in text and "{{ .Values.driverName }}/v1alpha1" in text
    assert "placeholder" not in text.lower()


def test_the_policy_matches_claims_templates_and_classes_and_denies() -> None:
    policy, binding = policy_objects("gpu.example.com", "p")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceclaims", "resourceclaimtemplates", "deviceclasses"]
    assert binding["spec"] == {"policyName": "p", "validationActions": ["Deny"]}
    assert 'c.opaque.driver == "gpu.example.com"' in policy["spec"]["variables"][2]["expression"]
