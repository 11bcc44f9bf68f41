"""Graph utilities many passes share: what kind of op a node calls, dynamic dims for a
re-capture, rewriting through the unlifted module, and what each op costs."""
