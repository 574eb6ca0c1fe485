    jmp nowhere
    end
