"""Unattended reruns: rerun (`orch nightly`: run, compare with the baseline, report) and
schedule (`orch schedule`: the systemd timer or crontab line that starts it)."""
