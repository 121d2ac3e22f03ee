"""Orchard's evaluator: task suites (`suites`), graders that run in sandboxes (`grading`, `swe_tests`), the
runner that drives a harness over a suite through the model gateway (`runner`), and the HTML report
(`report`). `orchard eval` / `orchard report` are thin over these modules."""
