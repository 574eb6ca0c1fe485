    jmp @100
    end
