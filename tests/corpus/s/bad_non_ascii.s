    movi x1, 1 ✓
    end
