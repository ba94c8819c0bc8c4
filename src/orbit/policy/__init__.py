"""Governance as code: a site's submission rules, in CEL, checked before they go live (their
own tests, a replay against past submissions) and evaluated at every submit. Pure, beside the
scheduler and forensics: it imports only the vocabulary (orbit.model), and the control plane
imports it."""
