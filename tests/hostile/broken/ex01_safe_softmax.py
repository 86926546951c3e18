"""Expected: error: your file does not parse (SyntaxError, line 3)."""

def safe_softmax(x)
    return x
