    movi x99, 1
    end
