"""``spectune experiment evidence``: the practice rules of speculative decoding, measured.

The seed's rules of thumb (draft size, architecture family, temperature, code against
chat, long outputs, trees, the K controller's thresholds, pausing, disabling) are each
measured on the target by one stage (``measure``, ``drafts``), cached as JSON in the
output folder (``stages``: a stage whose settings have not changed is skipped, so a run
resumes), then judged (``rules``) and written as one Markdown report with plots
(``report``). Every number in the report is read from a stage JSON.
"""
