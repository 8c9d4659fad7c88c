"""``spectune advise``: measure, predict, verify and recommend a speculative setup."""
