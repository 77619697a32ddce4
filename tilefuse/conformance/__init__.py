"""Running the ONNX backend node tests through tilefuse (`tilefuse conformance`)."""
from tilefuse.conformance.runner import CaseResult, Report, run_conformance

__all__ = ["CaseResult", "Report", "run_conformance"]
