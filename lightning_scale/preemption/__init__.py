"""Preemption notice sources: signals, files and cloud metadata services. One small class each."""

from lightning_scale.preemption.aws import AWSSpotNotice
from lightning_scale.preemption.azure import AzureScheduledEvents
from lightning_scale.preemption.file_notice import FileNotice
from lightning_scale.preemption.gcp import GCPPreemptionNotice
from lightning_scale.preemption.notice import Notice, NoticeSource
from lightning_scale.preemption.signal_notice import SignalNotice

__all__ = [
    "AWSSpotNotice",
    "AzureScheduledEvents",
    "FileNotice",
    "GCPPreemptionNotice",
    "Notice",
    "NoticeSource",
    "SignalNotice",
]
