    movi x1, 1 << 64
    end
