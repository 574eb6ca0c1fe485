.equ Z, 0
    movi x1, 8 / Z
    end
