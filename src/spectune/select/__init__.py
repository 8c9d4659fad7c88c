"""Draft selection: candidates and compatibility, teacher-forced acceptance (``alpha``),
measured costs and confirmation runs (``measure``), ranking (``selector``), reports."""
