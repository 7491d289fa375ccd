from django.db import models


class ReportRun(models.Model):
    """One run of the periodic report: when it started and ended (server clock)."""

    day = models.CharField(max_length=10)
    started = models.DateTimeField()
    finished = models.DateTimeField(null=True)
